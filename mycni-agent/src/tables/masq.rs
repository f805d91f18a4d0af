//! Masquerade of pod traffic leaving the cluster CIDR, in nftables tables
//! mycni owns alone (`ip mycni`, and `ip6 mycni` for IPv6): installing
//! replaces them atomically, so repeated runs are idempotent and nobody
//! else's rules are touched.
//!
//! IPv6 gets a table of its own family rather than one `inet` table for
//! both: the IPv4 table keeps exactly the name and shape agents before
//! dual-stack made (an upgrade replaces it in place, and nothing is left
//! behind under another name), and an IPv4-only cluster gets no IPv6 table
//! at all.

use anyhow::Result;

use crate::nft;
use mycni_common::net::ClusterCidrs;

pub const TABLE: &str = "mycni";

pub fn ruleset(cluster: impl Into<ClusterCidrs>) -> String {
    let cluster = cluster.into();
    // `table` + `delete table` first makes the replace work whether or not
    // the table exists; nft applies the whole file as one transaction. A
    // family the cluster has no range of gets its table deleted only (an
    // IPv6-only cluster: no `ip mycni`).
    let mut s = format!("table ip {TABLE}\ndelete table ip {TABLE}\n");
    if let Some(v4) = cluster.v4 {
        s += &format!(
            "table ip {TABLE} {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr {v4} ip daddr != {v4} masquerade comment \"mycni: pods leaving the cluster CIDR\"\n\
             \t}}\n\
             }}\n"
        );
    }
    s += &format!("table ip6 {TABLE}\ndelete table ip6 {TABLE}\n");
    // Pods' IPv6 addresses are mostly ULAs (fd00::/8) that the world
    // does not route back: they leave as the node's address, like IPv4.
    if let Some(v6) = cluster.v6 {
        s += &format!(
            "table ip6 {TABLE} {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip6 saddr {v6} ip6 daddr != {v6} masquerade comment \"mycni: pods leaving the IPv6 cluster CIDR\"\n\
             \t}}\n\
             }}\n"
        );
    }
    s
}

/// Puts the tables in place (replacing earlier ones); idempotent.
pub fn install(cluster: impl Into<ClusterCidrs>) -> Result<()> {
    nft::apply(&ruleset(cluster))
}

pub(crate) fn uninstall_script() -> String {
    format!(
        "table ip {TABLE}\ndelete table ip {TABLE}\ntable ip6 {TABLE}\ndelete table ip6 {TABLE}\n"
    )
}

/// Removes both tables (`mycni-agent uninstall`); success if they are gone.
pub fn uninstall() -> Result<()> {
    nft::apply(&uninstall_script())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mycni_common::net::{Cidr4 as Cidr, Cidr6};

    #[test]
    fn ipv6_gets_its_own_table_only_with_an_ipv6_cluster_cidr() {
        let v4 = Cidr::parse_network("10.244.0.0/16").expect("cidr");
        let single = ruleset(v4);
        assert!(single.contains("ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade"));
        assert!(!single.contains("ip6 saddr"));
        // A table left by an earlier dual-stack run goes.
        assert!(single.ends_with("delete table ip6 mycni\n"), "{single}");
        // The exact bytes agents before IPv6-only clusters wrote.
        assert_eq!(
            single,
            "table ip mycni\ndelete table ip mycni\ntable ip mycni {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade comment \"mycni: pods leaving the cluster CIDR\"\n\t}\n}\ntable ip6 mycni\ndelete table ip6 mycni\n"
        );
        let v6 = Cidr6::parse_network("fd00:10:244::/56").ok();
        let dual = ruleset(ClusterCidrs { v4: Some(v4), v6 });
        assert!(dual.starts_with(&single));
        assert!(
            dual.contains("ip6 saddr fd00:10:244::/56 ip6 daddr != fd00:10:244::/56 masquerade")
        );
        // IPv6-only: the ip6 table alone, an earlier run's ip table goes.
        let only6 = ruleset(ClusterCidrs { v4: None, v6 });
        assert!(
            only6.starts_with("table ip mycni\ndelete table ip mycni\ntable ip6 mycni\n"),
            "{only6}"
        );
        assert!(!only6.contains("ip saddr"), "{only6}");
        assert!(only6.ends_with(&dual[single.len()..]), "{only6}");
    }
}
