//! Read-only file mappings that say which file failed under them. A mapped
//! file truncated while in use makes the next access to a lost page raise
//! SIGBUS, which would kill the process with no message; every mapping is
//! registered here, and a SIGBUS handler names the file and exits with status
//! 1. Faults outside these mappings go to the handler that was there before.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use memmap2::Mmap;

use crate::error::{GraphError, Result};

/// Mappings that can be named at once; more are mapped all the same, unnamed.
const SLOTS: usize = 256;

/// One registered mapping: its address range and its message (see `message_for`).
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    message: AtomicPtr<u8>,
    message_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // the initialiser of the static array below
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    message: AtomicPtr::new(std::ptr::null_mut()),
    message_len: AtomicUsize::new(0),
};
static REGISTRY: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
/// The `sigaction` in place before ours, as raw bytes of `libc::sigaction` (restored for foreign faults).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// A read-only mapping of a whole file, registered for the SIGBUS message.
pub struct Mapped {
    map: Mmap,
    slot: Option<usize>,
}

impl Mapped {
    /// Maps `file` (opened from `path`) read-only.
    pub fn map(file: &File, path: &Path) -> Result<Mapped> {
        // SAFETY: inputs are treated as immutable while mapped; when one is
        // changed anyway, the SIGBUS handler installed below says so and exits.
        let map = unsafe { Mmap::map(file) }.map_err(|e| GraphError::io(path, e))?;
        let slot = register(map.as_ptr() as usize, map.len(), path);
        Ok(Mapped { map, slot })
    }
}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            REGISTRY[i].len.store(0, Ordering::SeqCst);
            REGISTRY[i].start.store(0, Ordering::SeqCst);
        }
    }
}

fn register(start: usize, len: usize, path: &Path) -> Option<usize> {
    if len == 0 {
        return None;
    }
    INSTALL.call_once(install);
    let message = message_for(path);
    let message_len = message.len();
    for (i, s) in REGISTRY.iter().enumerate() {
        // A slot is claimed by swapping its length from 0; start and message follow.
        if s.len
            .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            s.message
                .store(message.as_ptr().cast_mut(), Ordering::SeqCst);
            s.message_len.store(message_len, Ordering::SeqCst);
            s.start.store(start, Ordering::SeqCst);
            s.len.store(len, Ordering::SeqCst);
            return Some(i);
        }
    }
    None
}

/// The message for `path`, made once per path and kept for the process's
/// life (a handler may read it at any time): memory grows with the distinct
/// files mapped, not with the mappings.
fn message_for(path: &Path) -> &'static [u8] {
    static MESSAGES: Mutex<BTreeMap<PathBuf, &'static [u8]>> = Mutex::new(BTreeMap::new());
    let mut messages = MESSAGES.lock().unwrap_or_else(|p| p.into_inner());
    messages.entry(path.to_path_buf()).or_insert_with(|| {
        let text = format!("error: {}: the file changed (truncated?) while hetgnn had it mapped; inputs must not be modified while a run reads them\n", path.display());
        Box::leak(text.into_bytes().into_boxed_slice())
    })
}

fn install() {
    // SAFETY: a plain sigaction call with a zeroed struct filled as the man page says.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        let previous: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
        if libc::sigaction(libc::SIGBUS, &action, previous) == 0 {
            PREVIOUS.store(previous, Ordering::SeqCst);
        }
    }
}

/// Only async-signal-safe calls: loads, `write`, `_exit`, `sigaction`.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &REGISTRY {
        let (start, len) = (s.start.load(Ordering::SeqCst), s.len.load(Ordering::SeqCst));
        if len != usize::MAX && start != 0 && addr >= start && addr - start < len {
            let (ptr, n) = (
                s.message.load(Ordering::SeqCst),
                s.message_len.load(Ordering::SeqCst),
            );
            // SAFETY: messages live for the whole process (`message_for`).
            unsafe {
                libc::write(2, ptr as *const libc::c_void, n);
                libc::_exit(1);
            }
        }
    }
    // Not ours: put the previous handler back; the faulting access runs again and reaches it.
    let previous = PREVIOUS.load(Ordering::SeqCst);
    // SAFETY: `previous` was filled by sigaction and leaked.
    unsafe {
        if previous.is_null() {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        } else {
            libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
        }
    }
}
