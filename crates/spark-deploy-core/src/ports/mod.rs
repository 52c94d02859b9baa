//! Effect ports: Exec and Docker.
