"""What runs INSIDE the sandbox. Self-contained: nothing here imports the kit.

The parent copies these files into the sandbox's read-only job folder and runs
``zygote.py`` by path. The zygote imports trusted code (NumPy, torch, pytest,
the installed modules the submission names) before any submission file is on
``sys.path``, then forks one fresh process per task. Tasks load the submission's
files by path under fixed module names and send their answers back as data.
"""
