//! DOT export (to be written).
