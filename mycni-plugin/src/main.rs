//! `mycni`: the CNI plugin binary, run by the container runtime.

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let (out, ok) = mycni_plugin::run(&mut std::io::stdin().lock(), |k| std::env::var_os(k));
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
