"""One router per endpoint family; handlers stay thin and delegate to plain functions."""
