//! Seeded layered random DAGs with the HIOS simulation parameters (to be written).
