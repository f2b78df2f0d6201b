//! signature (to be written).
