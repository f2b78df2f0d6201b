//! cache (to be written).
