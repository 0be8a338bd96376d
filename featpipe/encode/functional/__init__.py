"""The functional cores of the encoders: plain functions, no scikit-learn, no torch."""
