//! The plugin's log: never stdout (that is the runtime's), a file under
//! /var/log/mycni by default, else stderr. Kept tiny because it runs on
//! every pod start.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static LEVEL: AtomicU8 = AtomicU8::new(2);
static SINK: Mutex<Option<std::fs::File>> = Mutex::new(None);
static PREFIX: Mutex<String> = Mutex::new(String::new());

fn level_of(s: &str) -> u8 {
    match s.to_ascii_lowercase().as_str() {
        "error" => 0,
        "warn" | "warning" => 1,
        "debug" => 3,
        _ => 2,
    }
}

/// `MYCNI_LOG_LEVEL` overrides the config's `logLevel`.
pub fn init(file: &Path, level: &str, prefix: String) {
    let level = std::env::var("MYCNI_LOG_LEVEL").unwrap_or_else(|_| level.to_string());
    LEVEL.store(level_of(&level), Ordering::Relaxed);
    let open = || OpenOptions::new().create(true).append(true).open(file);
    // The directory exists on all but a node's first call: made only then.
    let opened = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => file.parent().map_or(Err(e), |dir| {
            std::fs::create_dir_all(dir).and_then(|()| open())
        }),
        other => other,
    };
    if let Ok(f) = opened
        && let Ok(mut s) = SINK.lock()
    {
        *s = Some(f);
    }
    if let Ok(mut p) = PREFIX.lock() {
        *p = prefix;
    }
}

fn write(level: u8, tag: &str, msg: &str) {
    if level > LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let prefix = PREFIX.lock().map(|p| p.clone()).unwrap_or_default();
    let line = format!(
        "{}.{:03} {tag} {prefix} {msg}\n",
        ts.as_secs(),
        ts.subsec_millis()
    );
    match SINK.lock().as_deref_mut() {
        Ok(Some(f)) => {
            let _ = f.write_all(line.as_bytes());
        }
        _ => eprint!("{line}"),
    }
}

pub fn error(msg: &str) {
    write(0, "ERROR", msg);
}
pub fn warn(msg: &str) {
    write(1, "WARN", msg);
}
pub fn info(msg: &str) {
    write(2, "INFO", msg);
}
