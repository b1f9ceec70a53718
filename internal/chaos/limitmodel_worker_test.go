package chaos

func runLimitWorker() int { return exitSetup }
