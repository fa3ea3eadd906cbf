"""Runnable examples from the seeds (`python -m pxvm.examples.<name>`) and shipped programs."""
