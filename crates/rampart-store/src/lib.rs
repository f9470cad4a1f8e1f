//! SQLite state store.
