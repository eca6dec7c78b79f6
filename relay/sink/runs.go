package sink

// KeyRuns groups the indexes of records by key, each key's in the order
// given (id order), keys in the order of their first record; a record
// without a key is a run of its own. A sink that sends a key's records one
// after another, each once the one before it is stored, walks these runs.
func KeyRuns(records []Record) [][]int {
	var runs [][]int
	byKey := map[string]int{}
	for i, r := range records {
		if !r.HasKey {
			runs = append(runs, []int{i})
			continue
		}
		j, ok := byKey[r.Key]
		if !ok {
			j = len(runs)
			byKey[r.Key] = j
			runs = append(runs, nil)
		}
		runs[j] = append(runs[j], i)
	}
	return runs
}
