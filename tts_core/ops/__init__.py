"""What operators watch and steer: metrics, the monitor, degrade mode, GPU readings."""
