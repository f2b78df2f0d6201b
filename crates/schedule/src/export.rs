//! export (to be written).
