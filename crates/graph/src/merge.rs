//! IOS's operator merge rule (to be written).
