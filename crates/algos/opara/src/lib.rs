//! Opara stream allocation and resource- and interference-aware launch order (to be written).
