//! IOS dynamic programming over stages, with operator merge (to be written).
