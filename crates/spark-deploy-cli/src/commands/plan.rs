//! `spark-deploy plan [--json]`.

use spark_deploy_core::plan::{Plan, render::render_text};

use super::Global;
use crate::exit::Failure;
use crate::render;

pub(crate) fn run(global: &Global) -> Result<(), Failure> {
    let config = global.load()?;
    let plan = Plan::standard(&config).describe();
    if global.json {
        render::out(&plan.to_json());
    } else {
        render::out(&render_text(&plan));
    }
    Ok(())
}
