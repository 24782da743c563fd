"""Reports and measurements of a model or a run: the run's report and learning curve,
frequency-bin losses, gradient diversity, the subspace distance, t-SNE of WDR targets and word
probabilities. The trainer and the commands call them; an analysis that trains models is
handed its training, so nothing here imports ``targetlm.training``."""
