//! The local store's settings: its directory, from `--store local:DIR`,
//! else the default one.

use std::path::PathBuf;

use super::{OptionsError, StoreFlags};
use crate::store::kind::StoreSettings;
use crate::store::local;

#[derive(Debug)]
enum LocalFlagsError {
    NoDirectory { source: &'static str, text: String },
}

impl std::fmt::Display for LocalFlagsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LocalFlagsError::NoDirectory { source, text } => write!(
                f,
                "{source} '{text}' names no directory: write local:/path/to/dir, or local for the default"
            ),
        }
    }
}

impl std::error::Error for LocalFlagsError {}

impl From<LocalFlagsError> for OptionsError {
    fn from(error: LocalFlagsError) -> OptionsError {
        OptionsError::StoreFlags(Box::new(error))
    }
}

pub fn configure(flags: &StoreFlags<'_>) -> Result<Box<dyn StoreSettings>, OptionsError> {
    let base = match flags.text.strip_prefix("local:") {
        Some("") => {
            return Err(LocalFlagsError::NoDirectory {
                source: flags.source,
                text: flags.text.to_string(),
            }
            .into())
        }
        Some(dir) => PathBuf::from(dir),
        None => local::default_base((flags.env)("XDG_RUNTIME_DIR")),
    };
    Ok(Box::new(local::Settings { base }))
}
