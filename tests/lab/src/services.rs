//! Services as kube-proxy's nftables mode makes them: in every node's
//! namespace, DNAT from each pod's ClusterIP to the pod, at `prerouting`
//! (traffic from pods and other nodes) and `output` (the node's own
//! traffic), both at priority dstnat (-100; nft 1.0.6 names it at
//! prerouting only, so output has the number), so a policy decided in
//! `forward` (filter, 0) sees the backend pod, as it would behind
//! kube-proxy. The table is the lab's own: `inet mycni-lab-svc`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use mycni_testkit::sh;

use crate::model::{SERVICE_CIDR6, nominal_port};
use crate::{Lab, Pod};

pub const SERVICE_TABLE: &str = "mycni-lab-svc";

/// The ruleset (an atomic replacement of the lab's table) for `pods`.
pub fn ruleset(pods: &[Pod]) -> String {
    let mut rules = String::new();
    for p in pods {
        let Some(k) = &p.kube else { continue };
        for (vip, backend) in [
            (k.cluster_ip.map(IpAddr::V4), p.addr(crate::IpFamily::V4)),
            (k.cluster_ip6.map(IpAddr::V6), p.addr(crate::IpFamily::V6)),
        ] {
            let (Some(vip), Some(backend)) = (vip, backend) else {
                continue;
            };
            let (fam, target) = match backend {
                IpAddr::V4(a) => ("ip", a.to_string()),
                IpAddr::V6(a) => ("ip6", format!("[{a}]")),
            };
            for port in &k.ports {
                let proto = port.proto.lower();
                let svc_port = nominal_port(&port.name).unwrap_or(port.port);
                let _ = writeln!(
                    rules,
                    "    {fam} daddr {vip} {proto} dport {svc_port} dnat {fam} to {target}:{}",
                    port.port
                );
            }
        }
    }
    format!(
        "table inet {SERVICE_TABLE} {{}}\ndelete table inet {SERVICE_TABLE}\n\
         table inet {SERVICE_TABLE} {{\n  \
         chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    jump services\n  }}\n  \
         chain output {{\n    type nat hook output priority -100; policy accept;\n    jump services\n  }}\n  \
         chain services {{\n{rules}  }}\n}}\n"
    )
}

impl Lab {
    /// Writes every node's Service table for the lab's pods (at `up`, and
    /// after a pod is added or deleted).
    pub fn sync_services(&self) -> Result<()> {
        let pods = self.pods()?;
        let text = ruleset(&pods);
        for i in 1..=self.spec.nodes {
            let ns = self.spec.node_name(i);
            // A node's own connection to a ClusterIP needs a route before
            // `output` DNATs it (the kernel routes again after). A
            // dual-stack lab's nodes have no IPv6 default route (the
            // underlay is IPv4), so the IPv6 range gets one of its own, as
            // a real node's default route would serve.
            if self.spec.stack == crate::Stack::Dual {
                sh(
                    "ip",
                    &[
                        "-n",
                        &ns,
                        "-6",
                        "route",
                        "replace",
                        SERVICE_CIDR6,
                        "dev",
                        "lo",
                    ],
                )?;
            }
            let mut child = Command::new("ip")
                .args(["netns", "exec", &ns, "nft", "-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("running nft")?;
            child
                .stdin
                .take()
                .context("nft stdin")?
                .write_all(text.as_bytes())?;
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "nft in {ns}: {}\n{text}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ContainerPort, Proto, model_pod};

    #[test]
    fn each_named_port_dnats_to_its_number() {
        let mut k = model_pod(1, 1);
        k.ports = vec![ContainerPort {
            name: "serve-80-tcp".into(),
            port: 8080,
            proto: Proto::Tcp,
        }];
        let pod = Pod {
            node: 1,
            index: 1,
            ns: "n".into(),
            ip: "10.244.1.2".parse().expect("ip"),
            ip6: "fd00:10:244:1::2".parse().ok(),
            kube: Some(k),
        };
        let r = ruleset(&[pod]);
        assert!(
            r.contains("ip daddr 10.96.0.10 tcp dport 80 dnat ip to 10.244.1.2:8080"),
            "{r}"
        );
        assert!(
            r.contains("ip6 daddr fd00:10:96::a tcp dport 80 dnat ip6 to [fd00:10:244:1::2]:8080"),
            "{r}"
        );
        assert!(r.contains("hook prerouting priority dstnat"));
        assert!(r.contains("hook output priority -100"));
    }
}
