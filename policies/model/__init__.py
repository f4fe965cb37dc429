"""Model: what each option costs and gains. The hardware, model and drafter profiles (profiles.py, catalog.py,
quantization.py), the expected accepted length (acceptance.py), the roofline step time (roofline.py), the speedup
curve (costmodel.py), its one online calibration (calibrate.py, measured_profile.py) and uncertainty
(uncertainty.py), the objective it is measured in (objectives.py, slo_share.py), and the KV capacity
(kv_capacity.py)."""
