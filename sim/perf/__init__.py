"""The performance model: cost model, calibration, GPU and model catalogs, memory sizing."""
