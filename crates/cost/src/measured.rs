//! measured (to be written).
