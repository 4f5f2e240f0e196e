"""Runtime: policy workers (one engine + one learner per policy) hosted in-process or as Ray actors."""
