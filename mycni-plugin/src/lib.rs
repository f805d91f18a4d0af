//! mycni-plugin: the CNI plugin binary's library (the binary is `mycni`).

pub mod config;
pub mod error;
pub mod ipam;
pub mod log;
pub mod netlink;
pub mod plugin;
pub mod types;
pub mod version;

use std::ffi::OsString;
use std::io::Read;

use config::{Command, Env, NetConf};
use error::{CniError, Code};

/// Runs one invocation: returns what goes to stdout and whether it failed.
/// Everything the runtime sees passes through here, so exactly one JSON
/// object is printed whatever happens.
pub fn run(stdin: &mut dyn Read, get_env: impl Fn(&str) -> Option<OsString>) -> (String, bool) {
    let env = match Env::from_lookup(get_env) {
        Ok(e) => e,
        Err(e) => return (e.to_json(version::SUPPORTED[3]), false),
    };
    if env.command == Command::Version {
        return (version::version_json(), true);
    }
    // Room for a whole configuration up front: from an empty buffer,
    // `read_to_end` probes with 32 bytes and doubles, one read(2) each
    // (five for a 200-byte config, two with this).
    let mut raw = Vec::with_capacity(16 * 1024);
    if let Err(e) = stdin.read_to_end(&mut raw) {
        let err = CniError::new(
            Code::Io,
            format!("reading the network configuration from stdin: {e}"),
        );
        return (err.to_json(version::SUPPORTED[3]), false);
    }
    let conf = match NetConf::parse(&raw) {
        Ok(c) => c,
        Err(e) => {
            // Answer in the version the runtime asked for when it is readable.
            let v = serde_json::from_slice::<serde_json::Value>(&raw)
                .ok()
                .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
                .filter(|v| version::SUPPORTED.contains(&v.as_str()))
                .unwrap_or_else(|| version::SUPPORTED[3].to_string());
            return (e.to_json(&v), false);
        }
    };
    log::init(
        &conf.log_file,
        &conf.log_level,
        format!("{:?} {} {}", env.command, env.container_id, env.ifname),
    );
    let v = conf.cni_version;
    let outcome = match env.command {
        Command::Add => plugin::add(&conf, &env).map(|r| r.to_json(v).to_string()),
        Command::Del => plugin::del(&conf, &env).map(|()| String::new()),
        Command::Check if v.has_check() => plugin::check(&conf, &env).map(|()| String::new()),
        Command::Status | Command::Gc if !v.has_status_gc() => Err(CniError::new(
            Code::IncompatibleVersion,
            format!(
                "{:?} needs cniVersion 1.1.0, the config says {}",
                env.command,
                v.as_str()
            ),
        )),
        Command::Status => plugin::status(&conf, &env).map(|()| String::new()),
        Command::Gc => plugin::gc(&conf, &env).map(|()| String::new()),
        Command::Check => Err(CniError::new(
            Code::IncompatibleVersion,
            format!(
                "CHECK needs cniVersion 0.4.0 or later, the config says {}",
                v.as_str()
            ),
        )),
        Command::Version => Ok(version::version_json()),
    };
    match outcome {
        Ok(out) => {
            log::info("ok");
            (out, true)
        }
        Err(e) => {
            log::error(&format!("failed (code {}): {}", e.code as u32, e.msg));
            (e.to_json(v.as_str()), false)
        }
    }
}
