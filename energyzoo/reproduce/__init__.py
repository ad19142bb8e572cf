"""CPU-scale reruns of paper experiments, one file each (`energyzoo reproduce NAME`)."""
