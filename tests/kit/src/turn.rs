//! Turns: the tests of one module of a test binary may run side by side,
//! the tests of two modules never do.
//!
//! Each module of a subject's test binary (`tests/<subject>/main.rs`) was once a
//! binary of its own, and cargo runs binaries one after another: a test
//! could set an environment variable for the agents it starts
//! (`MYCNI_TC_ATTACH`, `MYCNI_KFUNC_PROBE`, ...), watch a kernel-wide
//! tracepoint, or bring up a model lab and count on no other lab loading the
//! machine. libtest runs a binary's tests on several threads, so each test
//! takes its module's turn first and holds it to its end: tests of the same
//! module still overlap as before, another module's wait.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Which module holds the turn, and how many of its tests are running.
struct Holder {
    module: Option<String>,
    running: usize,
}

static HOLDER: Mutex<Holder> = Mutex::new(Holder {
    module: None,
    running: 0,
});
static RELEASED: Condvar = Condvar::new();

/// A test's share of its module's turn, given back on drop (pass, fail or
/// panic).
#[must_use = "the turn ends when this is dropped: bind it to `_turn`"]
#[derive(Debug)]
pub struct Turn(());

/// Waits until no other module's test runs, then takes the turn of the
/// module of `module_path` (`module_path!()` in the test: its first two
/// segments, `<binary>::<module>`, name the module).
pub fn turn(module_path: &str) -> Turn {
    let module = module_of(module_path);
    let mut h = lock();
    while h.module.as_deref().is_some_and(|m| m != module) {
        h = RELEASED.wait(h).unwrap_or_else(PoisonError::into_inner);
    }
    h.module = Some(module.to_string());
    h.running += 1;
    Turn(())
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut h = lock();
        h.running -= 1;
        if h.running == 0 {
            h.module = None;
            RELEASED.notify_all();
        }
    }
}

/// A panicking test never holds the lock (only `turn` and `drop` take it,
/// briefly), so a poisoned one is still consistent.
fn lock() -> MutexGuard<'static, Holder> {
    HOLDER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `<binary>::<module>` of a `module_path!()`: a module's own submodules
/// share its turn.
fn module_of(module_path: &str) -> &str {
    match module_path.match_indices("::").nth(1) {
        Some((i, _)) => &module_path[..i],
        None => module_path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submodules_share_their_modules_turn() {
        assert_eq!(
            module_of("datapath::ebpf_prog::encap"),
            "datapath::ebpf_prog"
        );
        assert_eq!(module_of("datapath::ebpf_prog"), "datapath::ebpf_prog");
        assert_eq!(module_of("datapath"), "datapath");
    }

    #[test]
    fn a_module_waits_for_the_other_to_finish() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::Duration;
        static A_DONE: AtomicBool = AtomicBool::new(false);
        let a1 = turn("x::a");
        let a2 = turn("x::a::sub");
        let b = std::thread::spawn(|| {
            let _b = turn("x::b");
            A_DONE.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(a1);
        std::thread::sleep(Duration::from_millis(50));
        A_DONE.store(true, Ordering::SeqCst);
        drop(a2);
        assert!(b.join().unwrap_or(false), "b ran while a held the turn");
    }
}
