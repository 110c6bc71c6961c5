"""The operator's actions on one RLJob, over the pure cores and the cluster's adapters: write its children (the
one writer), refresh its status (observe, decide, write), post its Events, and the state they share (`Context`)."""
