//! Tuning of jemalloc, the allocator both binaries install: freed memory is
//! handed back to the OS about a second after a burst, by jemalloc's own
//! background thread, so RSS falls again without any allocation activity.
//! (glibc's per-thread arenas and growing mmap threshold kept tens of MiB
//! after a burst of large request bodies.)

use tikv_jemalloc_ctl::{Access, AsName};

/// Dirty pages are purged this long after they were freed.
const DIRTY_DECAY_MS: isize = 1000;

/// Turns on background purging with a short decay; call once at startup
/// (before worker threads are spawned, so their arenas inherit it). Returns
/// what could not be set, for a warning.
pub fn tune_jemalloc() -> Result<(), String> {
    // Purge dirty pages straight away (MADV_DONTNEED), not through the
    // "muzzy" stage, whose MADV_FREE pages still count in RSS.
    let set = |name: &'static [u8], ms: isize| name.name().write(ms).map_err(|e| e.to_string());
    set(b"arenas.dirty_decay_ms\0", DIRTY_DECAY_MS)?;
    set(b"arenas.muzzy_decay_ms\0", 0)?;
    // Arenas already created keep their own settings.
    let narenas: u32 = b"arenas.narenas\0".name().read().map_err(|e| e.to_string())?;
    for i in 0..narenas {
        let dirty = format!("arena.{i}.dirty_decay_ms\0");
        let muzzy = format!("arena.{i}.muzzy_decay_ms\0");
        // Arenas not yet initialized refuse; they get the defaults above.
        let _ = dirty.as_bytes().name().write(DIRTY_DECAY_MS);
        let _ = muzzy.as_bytes().name().write(0isize);
    }
    tikv_jemalloc_ctl::background_thread::write(true).map_err(|e| e.to_string())
}
