"""Load generation for the TTS suite: `locust -f loadtest/tts.py` and the modules it wires together."""
