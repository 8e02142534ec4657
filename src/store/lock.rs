//! One process per store: an exclusive `flock` on a `.lock` file beside the database directory.
//! It sits beside, not inside, so a wipe can remove the database without dropping the lock.
//!
//! Another program may have the database open without knowing of that file: a Kafka Streams
//! application opening its own state directory. RocksDB locks the database's `LOCK` file with
//! `fcntl`, and an open that meets that lock fails like a damaged store would, so warmstore asks
//! who holds it before it opens anything: a store in use is left alone, never wiped.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use super::StoreError;

/// Held for as long as the store is open; the kernel releases it if the process dies.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    /// Takes the lock without waiting. On conflict the error names the store directory and the pid
    /// recorded by the holder.
    pub fn acquire(lock_path: &Path, store_dir: &Path) -> Result<StoreLock, StoreError> {
        let io = |source| StoreError::Io {
            path: lock_path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_path)
            .map_err(io)?;
        match try_lock_awhile(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(StoreError::Locked {
                    dir: store_dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "an unknown process".to_string()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(TryLockError::Error(source)) => return Err(io(source)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        write!(file, "pid {}", std::process::id()).map_err(io)?;
        Ok(StoreLock { _file: file })
    }
}

/// How long a lock held by someone else may take to come free before the store counts as locked.
const LOCK_PATIENCE: Duration = Duration::from_millis(200);

/// `try_lock`, tried again for a short while. A `flock` belongs to the open file, which a process
/// started at that moment shares until it executes its program: a store closed and reopened
/// while another thread starts a process can find its own lock still held for that instant.
fn try_lock_awhile(file: &File) -> Result<(), TryLockError> {
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if started.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => return other,
        }
    }
}

/// The pid of another process that holds RocksDB's `fcntl` lock on `<db_dir>/LOCK`, if any.
pub fn rocksdb_lock_holder(db_dir: &Path) -> std::io::Result<Option<i32>> {
    fcntl_lock_holder(&db_dir.join("LOCK"))
}

/// The pid of another process that holds an `fcntl` lock on `path` (as Java's `FileChannel`
/// locks and RocksDB's `LOCK` are), if any.
pub fn fcntl_lock_holder(path: &Path) -> std::io::Result<Option<i32>> {
    use std::os::fd::AsRawFd;
    let file = match File::open(path) {
        Ok(file) => file,
        // No database here (or a file where its directory should be): nothing holds it, and
        // the dirty rules judge what is there.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    // SAFETY: `flock` is a plain C struct; zeroed is a valid value for every field.
    let mut query: libc::flock = unsafe { std::mem::zeroed() };
    query.l_type = libc::F_WRLCK as libc::c_short;
    query.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: F_GETLK only reads and writes the struct passed to it.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut query) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((query.l_type != libc::F_UNLCK as libc::c_short).then_some(query.l_pid))
}
