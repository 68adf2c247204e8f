"""Flax building blocks. They know nothing of architectures or objectives.

Dimension key, used in every array name and einsum of lmsuite (`x_BLD`, `w_DHK`):

    B batch           L length (queries)     M key / memory length
    D model width     H heads                K head width
    F mlp width       V vocabulary           E factorized embedding width
    P gathered (predicted) positions         T segment-type vocabulary
    R relative-position buckets or distances
    C cached memory length (Transformer-XL / XLNet; its keys are M = C + L)
"""
