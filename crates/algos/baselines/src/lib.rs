//! Baseline schedulers (to be written).
