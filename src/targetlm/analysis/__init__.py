"""Reports and plots; later issues add frequency-bin losses, gradient diversity, subspaces, t-SNE."""
