"""Inputs: sequence lengths (lists, files, distributions) and request traces."""
