"""Everything that speaks SLURM: formats (hostlists, times, memory) and, later, its commands."""
