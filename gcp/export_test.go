package gcp

// SetSubscriptionLabelBound lowers the number of subscriptions with their own metric labels
// (maxLabelValues), so a test reaches the "_other" bound with a few.
func SetSubscriptionLabelBound(s *Server, n int) {
	s.m.subs.mu.Lock()
	s.m.subs.max = n
	s.m.subs.mu.Unlock()
}
