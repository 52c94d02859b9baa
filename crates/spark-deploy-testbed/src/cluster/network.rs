//! The fabric and management networks: Docker bridge networks on 198.18.0.0/24 and
//! 198.18.1.0/24 whose gateways (`.1`) are the head in the root network namespace.

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;

use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
use spark_deploy_core::ports::docker::{DockerError, DockerNode};

use super::labels;

/// Errors of network setup.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The routing table could not be read.
    #[error("cannot read the routing table /proc/net/route: {source}")]
    Routes {
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// Another interface already routes a testbed subnet.
    #[error(
        "interface {iface} already routes {route}, which overlaps the testbed subnet {subnet} \
         (remedy: remove that interface or route, e.g. `ip route del {route}`, or run \
         `spark-deploy testbed down` if it is a leftover testbed bridge)"
    )]
    SubnetInUse {
        /// The interface.
        iface: String,
        /// The route it has.
        route: String,
        /// The testbed subnet.
        subnet: String,
    },
    /// A Docker call failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
}

/// One IPv4 route of the kernel table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Interface name.
    pub iface: String,
    /// Destination network.
    pub dest: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
}

/// Parses `/proc/net/route` (little-endian hex destination and mask).
pub fn parse_routes(text: &str) -> Vec<Route> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let dest = u32::from_str_radix(f[1], 16).ok()?;
            let mask = u32::from_str_radix(f[7], 16).ok()?;
            Some(Route {
                iface: f[0].to_owned(),
                // The kernel prints the address as a native-endian u32 of network-order bytes.
                dest: Ipv4Addr::from(dest.to_ne_bytes()),
                prefix: u8::try_from(mask.count_ones()).unwrap_or(32),
            })
        })
        .collect()
}

fn overlaps(a: (Ipv4Addr, u8), b: (Ipv4Addr, u8)) -> bool {
    let p = a.1.min(b.1);
    let mask = if p == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(p))
    };
    (u32::from(a.0) & mask) == (u32::from(b.0) & mask)
}

/// Fails if any interface routes a network overlapping `subnet` (default routes excluded).
///
/// # Errors
///
/// [`NetworkError::SubnetInUse`] naming the interface and route, or [`NetworkError::Routes`].
pub fn check_subnet_free(subnet: (Ipv4Addr, u8)) -> Result<(), NetworkError> {
    let text = std::fs::read_to_string("/proc/net/route")
        .map_err(|source| NetworkError::Routes { source })?;
    check_routes(&parse_routes(&text), subnet)
}

fn check_routes(routes: &[Route], subnet: (Ipv4Addr, u8)) -> Result<(), NetworkError> {
    for r in routes {
        if r.prefix > 0 && overlaps((r.dest, r.prefix), subnet) {
            return Err(NetworkError::SubnetInUse {
                iface: r.iface.clone(),
                route: format!("{}/{}", r.dest, r.prefix),
                subnet: labels::cidr(subnet),
            });
        }
    }
    Ok(())
}

/// Creates a labelled bridge network on `subnet` with gateway `.1` and Linux bridge `bridge`.
///
/// # Errors
///
/// [`NetworkError::Docker`] with [`DockerError::CreateNetwork`].
pub async fn create(
    docker: &DockerNode,
    name: &str,
    bridge: &str,
    subnet: (Ipv4Addr, u8),
    role: &str,
) -> Result<String, NetworkError> {
    let req = NetworkCreateRequest {
        name: name.to_owned(),
        driver: Some("bridge".to_owned()),
        ipam: Some(Ipam {
            driver: Some("default".to_owned()),
            config: Some(vec![IpamConfig {
                subnet: Some(labels::cidr(subnet)),
                gateway: Some(labels::host(subnet, 1).to_string()),
                ..Default::default()
            }]),
            options: None,
        }),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.name".to_owned(),
            bridge.to_owned(),
        )])),
        labels: Some(labels::labels(role)),
        ..Default::default()
    };
    Ok(docker.create_network(req).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    #[test]
    fn parses_proc_net_route() {
        let r = parse_routes(TABLE);
        assert_eq!(r.len(), 3);
        assert_eq!(r[1].dest, Ipv4Addr::new(172, 17, 0, 0));
        assert_eq!(r[1].prefix, 16);
        assert_eq!(r[2].dest, Ipv4Addr::new(192, 0, 2, 0));
        assert_eq!(r[2].prefix, 24);
    }

    #[test]
    fn default_route_does_not_count_but_overlaps_do() {
        let mut r = parse_routes(TABLE);
        check_routes(&r, labels::FABRIC_SUBNET).unwrap();
        r.push(Route {
            iface: "br-x".into(),
            dest: Ipv4Addr::new(198, 18, 0, 0),
            prefix: 15,
        });
        let e = check_routes(&r, labels::FABRIC_SUBNET).unwrap_err();
        assert!(
            e.to_string().contains("br-x already routes 198.18.0.0/15"),
            "{e}"
        );
        assert!(e.to_string().contains("remedy"), "{e}");
    }
}
