//! What can go wrong in a command, typed: a file that cannot be read or written (with the
//! system's reason), an input that is not what the command needs, or arguments that do not go
//! together. Each prints as the one line `cpuprof: ...` the user reads, exit status 1.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum Error {
    /// A file or directory that cannot be read.
    Read { path: PathBuf, source: io::Error },
    /// A file or directory that cannot be created.
    Create { path: PathBuf, source: io::Error },
    /// A file that cannot be written.
    Write { path: PathBuf, source: io::Error },
    /// An input that is not what the command needs: the message names it and says what is
    /// wrong and where.
    Input(String),
    /// Arguments that do not go together, beyond what clap checks.
    Usage(&'static str),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn read(path: &Path, source: io::Error) -> Error {
        Error::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn create(path: &Path, source: io::Error) -> Error {
        Error::Create {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn write(path: &Path, source: io::Error) -> Error {
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Error::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Error::Create { path, source } => write!(f, "cannot create {}: {source}", path.display()),
            Error::Write { path, source } => write!(f, "cannot write {}: {source}", path.display()),
            Error::Input(message) => f.write_str(message),
            Error::Usage(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Read { source, .. } | Error::Create { source, .. } | Error::Write { source, .. } => Some(source),
            Error::Input(_) | Error::Usage(_) => None,
        }
    }
}

/// The readers below the commands say what is wrong in a sentence of their own.
impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::Input(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_file_and_the_reason() {
        let e = Error::write(Path::new("/x.prof"), io::Error::from_raw_os_error(28));
        assert_eq!(
            e.to_string(),
            "cannot write /x.prof: No space left on device (os error 28)"
        );
        assert_eq!(Error::from("bad".to_string()).to_string(), "bad");
    }
}
