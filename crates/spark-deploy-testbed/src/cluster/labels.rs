//! Names, labels and addresses of the testbed cluster.
//!
//! Names are fixed, so one testbed runs at a time on a Docker daemon. Everything the testbed
//! creates in Docker carries [`LABEL`]` = `[`LABEL_VALUE`], and `down` removes exactly the
//! objects carrying it.

use std::collections::HashMap;
use std::net::Ipv4Addr;

/// The label every testbed object carries.
pub const LABEL: &str = "io.spark-deploy.testbed";
/// Its value.
pub const LABEL_VALUE: &str = "1";
/// `key=value` filter for [`LABEL`].
pub const LABEL_FILTER: &str = "io.spark-deploy.testbed=1";
/// The role of an object (`fabric`, `management`, `worker`, `node-image`).
pub const LABEL_ROLE: &str = "io.spark-deploy.testbed.role";
/// On the node image: the hash of the recipe it was built from.
pub const LABEL_RECIPE: &str = "io.spark-deploy.testbed.recipe";

/// Prefix of every Docker object name.
pub const PREFIX: &str = "spark-deploy-testbed";
/// The fabric network (stand-in for the ConnectX-7 link).
pub const FABRIC_NETWORK: &str = "spark-deploy-testbed-fabric";
/// The management network (the head reaches workers' sshd here).
pub const MANAGEMENT_NETWORK: &str = "spark-deploy-testbed-mgmt";
/// Linux bridge name of the fabric network.
pub const FABRIC_BRIDGE: &str = "sd-fabric0";
/// Linux bridge name of the management network.
pub const MANAGEMENT_BRIDGE: &str = "sd-mgmt0";
/// Repository of the node image (the tag is the recipe hash).
pub const NODE_IMAGE_REPO: &str = "spark-deploy-testbed/node";

/// Fabric subnet; the head is the gateway `.1`, worker `i` (1-based) is `.(i+1)`.
pub const FABRIC_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 24);
/// Management subnet, same numbering.
pub const MANAGEMENT_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 1, 0), 24);

/// The largest number of workers the address plan allows.
pub const MAX_WORKERS: u8 = 8;

/// Host `n` of a /24 subnet.
pub fn host(subnet: (Ipv4Addr, u8), n: u8) -> Ipv4Addr {
    let [a, b, c, _] = subnet.0.octets();
    Ipv4Addr::new(a, b, c, n)
}

/// `a.b.c.d/len`.
pub fn cidr(subnet: (Ipv4Addr, u8)) -> String {
    format!("{}/{}", subnet.0, subnet.1)
}

/// The node name of worker `i` (1-based): `worker-<i>`.
pub fn worker_name(i: u8) -> String {
    format!("worker-{i}")
}

/// The container name of worker `i`: `spark-deploy-testbed-worker-<i>`.
pub fn worker_container(i: u8) -> String {
    format!("{PREFIX}-worker-{i}")
}

/// The labels of an object with `role`.
pub fn labels(role: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL.to_owned(), LABEL_VALUE.to_owned()),
        (LABEL_ROLE.to_owned(), role.to_owned()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_plan() {
        assert_eq!(host(FABRIC_SUBNET, 1).to_string(), "198.18.0.1");
        assert_eq!(host(MANAGEMENT_SUBNET, 2).to_string(), "198.18.1.2");
        assert_eq!(cidr(FABRIC_SUBNET), "198.18.0.0/24");
        assert_eq!(worker_container(1), "spark-deploy-testbed-worker-1");
        assert_eq!(LABEL_FILTER, format!("{LABEL}={LABEL_VALUE}"));
        assert!(FABRIC_BRIDGE.len() <= 15 && MANAGEMENT_BRIDGE.len() <= 15);
    }
}
