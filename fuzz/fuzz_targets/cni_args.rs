//! `CNI_ARGS` (`K=V;K=V`), directly and through `Env::from_lookup` as the
//! binary reads it, and the host veth name derived from the pod it names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mycni_plugin::config::{CniArgs, Env, valid_ifname};
use mycni_plugin::error::Code;
use mycni_plugin::plugin::host_veth_name;

fn env(args: &str, ifname: &str) -> Result<Env, mycni_plugin::error::CniError> {
    Env::from_lookup(|k| {
        match k {
            "CNI_COMMAND" => Some("ADD"),
            "CNI_CONTAINERID" => Some("0123abcd"),
            "CNI_NETNS" => Some("/run/netns/fuzz"),
            "CNI_IFNAME" => Some(ifname),
            "CNI_PATH" => Some("/opt/cni/bin"),
            "CNI_ARGS" => Some(args),
            _ => None,
        }
        .map(std::ffi::OsString::from)
    })
}

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let a = match CniArgs::parse(&s) {
        Ok(a) => a,
        Err(e) => {
            assert!(!e.msg.is_empty());
            assert!(
                matches!(e.code, Code::InvalidEnv | Code::UnsupportedField),
                "{:?}: {}",
                e.code,
                e.msg
            );
            let via_env = env(&s, "eth0").map(|_| ()).map_err(|e| e.code);
            assert_eq!(via_env, Err(e.code));
            return;
        }
    };
    // Rendered again, the arguments parse to themselves.
    let mut parts = vec!["IgnoreUnknown=1".to_string()];
    for (k, v) in [
        ("K8S_POD_NAMESPACE", &a.pod_namespace),
        ("K8S_POD_NAME", &a.pod_name),
        ("K8S_POD_INFRA_CONTAINER_ID", &a.infra_container_id),
        ("K8S_POD_UID", &a.pod_uid),
    ] {
        if let Some(v) = v {
            parts.push(format!("{k}={v}"));
        }
    }
    for (k, v) in &a.other {
        assert!(!k.is_empty() && !k.contains(['=', ';']) && !v.contains(';'));
        parts.push(format!("{k}={v}"));
    }
    match CniArgs::parse(&parts.join(";")) {
        Ok(b) => assert_eq!(a, b),
        Err(e) => panic!("{:?} rendered as {parts:?} does not parse: {e}", a),
    }
    // Whatever the pod is called, its host veth gets a valid 15-byte name.
    for ifname in ["eth0", "net1"] {
        let e = match env(&s, ifname) {
            Ok(e) => e,
            Err(e) => panic!("CNI_ARGS parses alone but not in the environment: {e}"),
        };
        assert_eq!(e.args, a);
        let name = host_veth_name(&e);
        assert!(name.len() == 15 && valid_ifname(&name), "{name:?}");
    }
});
