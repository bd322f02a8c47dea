"""Hypothesis profiles: ``mutation`` (tools/mutation.py sets it) runs fewer, derandomized
examples, so every mutant meets the same inputs and a kill does not depend on luck."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("mutation", max_examples=30, derandomize=True, deadline=None, database=None)
if os.environ.get("NRIPLUGIN_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["NRIPLUGIN_HYPOTHESIS_PROFILE"])
