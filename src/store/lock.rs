//! One process per store: an exclusive `flock` on a `.lock` file beside the database directory.
//! It sits beside, not inside, so a wipe can remove the database without dropping the lock.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

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
        match file.try_lock() {
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
