"""hpc's release, and the Accelerate API level it implements.

Scripts written for Accelerate gate features on its version (diffusers registers its save/load hooks only when
`accelerate.__version__ >= 0.16.0`). With `import hpc as accelerate` they read `hpc.__version__`, so that string
is the Accelerate release whose API hpc implements, with hpc's own release as its local label:
"1.15.0+hpc.0.1.0" compares as 1.15.0 in packaging.version, and still says which hpc it is.
"""

HPC_VERSION = "0.1.0"  # keep equal to pyproject.toml's version (tests/test_packaging.py checks)
ACCELERATE_API_VERSION = "1.15.0"
__version__ = f"{ACCELERATE_API_VERSION}+hpc.{HPC_VERSION}"
