"""Tools beside the product: benchmarks, soak, calibration, the fake server, the browser driver, fault tables.

Nothing in tts_predictor/, ttssim/, loadtest/ or ttsreport/ imports from here.
"""
