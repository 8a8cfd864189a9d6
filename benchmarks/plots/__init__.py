"""Plots of saved runs."""
