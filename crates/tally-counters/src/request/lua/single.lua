return decide(0, 0, #KEYS, clock())
