"""This process and what it shares with the others: its place in the job (ProcessState), Accelerate's
PartialState and AcceleratorState, the collectives and the walk over nested data, the stop vote that rides on
them, the run's counters (TrainingState, GradientState) and each rank's random state."""
