"""The pause a test script takes each step, standing for a wait on input or on a GPU (it changes no number), and
its end: once the file `unpaced_when` exists (the test has seen what the pacing was for), no more pauses."""
import os
import time


def pause(seconds: float, unpaced_when) -> None:
    if seconds and not (unpaced_when and os.path.exists(unpaced_when)):
        time.sleep(seconds)
