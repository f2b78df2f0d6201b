//! LIOS list scheduling of operators on streams (to be written).
