"""Step 2, robustness: the task metric under severity-graded perturbations and missing modalities."""
