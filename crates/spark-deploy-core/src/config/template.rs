//! The commented default configuration `spark-deploy init` writes.

/// The template: parses to [`super::DeploymentConfig::default`] (a test pins that).
pub const TEMPLATE: &str = include_str!("template.toml");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeploymentConfig, parse};

    #[test]
    fn template_is_the_default() {
        let c = parse(TEMPLATE, std::path::Path::new("template.toml")).unwrap();
        assert_eq!(c, DeploymentConfig::default());
    }
}
