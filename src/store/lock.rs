//! One process per store: an exclusive `flock` on a `.lock` file beside the database directory.
//! It sits beside, not inside, so a wipe can remove the database without dropping the lock.
//!
//! While RocksDB has the database open, its own `fcntl` lock on `LOCK` keeps every other process
//! out, and warmstore checks that lock before it opens anything. So the `flock` is let go for that
//! time and taken again before the database closes for a wipe: one descriptor fewer per open store,
//! which is what a thousand store partitions in one process meet first. Within the process a table
//! of held lock files (by inode, so two spellings of one path are one store) does what the `flock`
//! did between two opens in one process.
//!
//! Another program may have the database open without knowing of that file: a Kafka Streams
//! application opening its own state directory. An open that meets RocksDB's lock fails like a
//! damaged store would, so warmstore asks who holds it before it opens anything: a store in use is
//! left alone, never wiped.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{io_at, StoreError};

/// The lock files (device and inode) of the stores this process holds.
static HELD: Mutex<BTreeSet<(u64, u64)>> = Mutex::new(BTreeSet::new());

/// Held for as long as the store is open; the kernel releases the `flock` (and RocksDB's lock) if
/// the process dies.
#[derive(Debug)]
pub struct StoreLock {
    path: PathBuf,
    store_dir: PathBuf,
    inode: (u64, u64),
    /// The `flock`, `None` while RocksDB's lock stands in for it.
    file: Option<File>,
}

impl StoreLock {
    /// Takes the lock without waiting. On conflict the error names the store directory and the pid
    /// recorded by the holder.
    pub fn acquire(lock_path: &Path, store_dir: &Path) -> Result<StoreLock, StoreError> {
        let file = open_lock_file(lock_path)?;
        let metadata = file.metadata().map_err(io_at(lock_path))?;
        let inode = (metadata.dev(), metadata.ino());
        if !HELD
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(inode)
        {
            return Err(StoreError::Locked {
                dir: store_dir.to_path_buf(),
                holder: format!("this process (pid {})", std::process::id()),
            });
        }
        // From here on, dropping the lock forgets the inode again.
        let mut lock = StoreLock {
            path: lock_path.to_path_buf(),
            store_dir: store_dir.to_path_buf(),
            inode,
            file: None,
        };
        lock.flock(file)?;
        Ok(lock)
    }

    /// Lets go of the `flock` once RocksDB has the database open and its `LOCK` keeps others out.
    pub fn yield_to_rocksdb(&mut self) {
        self.file = None;
    }

    /// Takes the `flock` again before the database closes for a wipe; until RocksDB opens the new
    /// one, the `flock` is all that keeps another process out.
    pub fn take_back(&mut self) -> Result<(), StoreError> {
        if self.file.is_none() {
            let file = open_lock_file(&self.path)?;
            self.flock(file)?;
        }
        Ok(())
    }

    fn flock(&mut self, mut file: File) -> Result<(), StoreError> {
        match try_lock_awhile(&file) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(StoreError::Locked {
                    dir: self.store_dir.clone(),
                    holder: if holder.is_empty() {
                        "an unknown process".to_string()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(TryLockError::Error(source)) => return Err(io_at(&self.path)(source)),
        }
        file.set_len(0).map_err(io_at(&self.path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_at(&self.path))?;
        write!(file, "pid {}", std::process::id()).map_err(io_at(&self.path))?;
        self.file = Some(file);
        Ok(())
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        HELD.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.inode);
    }
}

fn open_lock_file(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io_at(path))
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
/// Only for a database this process does not have open: closing any descriptor of a file drops
/// every `fcntl` lock the process holds on it, RocksDB's included. `StoreLock::acquire` comes first
/// and refuses a store this process holds.
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
