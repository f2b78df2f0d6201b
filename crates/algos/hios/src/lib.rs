//! HIOS-LP and HIOS-MR multi-GPU scheduling with intra-GPU sliding-window parallelization (to be written).
