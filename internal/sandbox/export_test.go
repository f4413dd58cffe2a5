package sandbox

// AbandonPools stops filling the pools and forgets their sandboxes without
// destroying them, as a crash of kiln serve would leave them.
func (m *Manager) AbandonPools() {
	p := m.pool()
	p.mu.Lock()
	p.closed = true
	p.cancel()
	p.ready = map[string][]*pooled{}
	p.mu.Unlock()
	<-p.done
}
