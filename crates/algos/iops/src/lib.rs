//! IOPS block split, operator replacement versus parallel scheduling, templated DP (to be written).
